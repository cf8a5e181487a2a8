//! The PostgreSQL group committer's connection: each batch is one transaction on a connection of
//! the committer's own pool (a dropped connection is replaced by the pool on the next batch).
//! The rows a batch decides on (branch and function heads) are locked as it reads them, so
//! batches of two replicas on one branch take turns, and the later one checks its appends
//! against the head the earlier one committed. On a distributed database each lane of the
//! committer is one of these, and a batch's transaction holds one shard's appends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{PgConnection, Postgres};

use super::{Conn, Connection};
use crate::domain::{BranchName, NodeId, SessionId};
use crate::store::Result;
use crate::store::append::planned::BatchRows;
use crate::store::backend::CommitterConnection;

/// How the committer splits a batch into transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Batching {
    /// On one database: the batch's sessions spread over the lanes by id, one transaction per
    /// lane, committed at once (PostgreSQL overlaps their commits; one lane would wait for
    /// each in turn).
    Spread,
    /// One per Citus node: the sessions whose shards one worker holds.
    ByShard,
    /// One per session (the distributed form on one database, for its tests).
    BySession,
}

pub(super) struct Committer {
    pool: PgPool,
    tx: Option<sqlx::Transaction<'static, Postgres>>,
    batching: Batching,
    /// On Citus: where a call written at once goes (the worker of its sessions' shard).
    workers: Option<Arc<Workers>>,
}

impl Committer {
    pub(super) fn new(pool: PgPool, batching: Batching, workers: Option<Arc<Workers>>) -> Self {
        Self {
            pool,
            tx: None,
            batching,
            workers,
        }
    }

    /// The pool a call written at once for `session` goes to: on Citus the worker that holds
    /// the session's shard (the call then runs there without passing through the coordinator),
    /// else, or where that worker is not known, the committer's own.
    fn at_once_pool(&self, session: SessionId) -> PgPool {
        self.workers
            .as_ref()
            .and_then(|workers| workers.pool_for(session))
            .unwrap_or_else(|| self.pool.clone())
    }
}

/// The Citus workers a replica's committer writes to directly: a call of
/// `ctxd_append_at_once` sent to the worker that holds its session's shard runs there whole
/// (Citus delegates it to the local shard), sparing the coordinator's planning and a network
/// hop on every append. Every other statement still goes through the coordinator.
pub(super) struct Workers {
    /// The coordinator's options (user, password, TLS, database), with each worker's address.
    options: PgConnectOptions,
    size: u32,
    /// Each session's worker, as the coordinator placed its shard.
    nodes: Mutex<HashMap<SessionId, (String, u16)>>,
    pools: Mutex<HashMap<(String, u16), PgPool>>,
}

/// Sessions whose worker is remembered at most; past it the memory starts over.
const KNOWN_NODES: usize = 100_000;

impl Workers {
    pub(super) fn new(options: PgConnectOptions, size: u32) -> Self {
        Self {
            options,
            size,
            nodes: Mutex::default(),
            pools: Mutex::default(),
        }
    }

    /// Remembers where `sessions` live, as [`CommitterConnection::shards`] found them.
    fn remember(&self, sessions: &[SessionId], nodes: impl IntoIterator<Item = (String, u16)>) {
        let mut known = lock(&self.nodes);
        if known.len() + sessions.len() > KNOWN_NODES {
            known.clear();
        }
        known.extend(sessions.iter().copied().zip(nodes));
    }

    /// The pool of the worker that holds `session`'s shard, when it is known (the committer
    /// asks where each session of a batch lives before writing it).
    fn pool_for(&self, session: SessionId) -> Option<PgPool> {
        let node = lock(&self.nodes).get(&session).cloned()?;
        let mut pools = lock(&self.pools);
        let pool = pools.entry(node).or_insert_with_key(|(name, port)| {
            // Connected on first use; a worker that cannot be reached fails that call, which
            // the committer then writes the usual way through the coordinator.
            PgPoolOptions::new()
                .max_connections(self.size)
                .test_before_acquire(false)
                .connect_lazy_with(self.options.clone().host(name).port(*port))
        });
        Some(pool.clone())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Connection for Committer {
    fn conn(&mut self) -> &mut PgConnection {
        // The committer reads and writes only between `begin` and `commit` or `rollback`.
        self.tx.as_mut().expect("a batch's transaction is open")
    }

    fn locks(&self) -> bool {
        true
    }

    fn routed(&self) -> bool {
        self.batching != Batching::Spread
    }
}

#[async_trait]
impl CommitterConnection for Conn<Committer> {
    fn sharded(&self) -> bool {
        true
    }

    async fn shards(&mut self, sessions: &[SessionId]) -> Result<Vec<(i64, i64)>> {
        match self.0.batching {
            Batching::ByShard => {
                let ids: Vec<Vec<u8>> = sessions.iter().map(|s| s.as_bytes().to_vec()).collect();
                // Each session's shard and the node that holds it (its group and address),
                // computed on the coordinator from its metadata: no shard is read.
                let rows: Vec<(i64, i64, String, i32)> = sqlx::query_as(
                    "SELECT DISTINCT ON (q.i) n.groupid::int8, q.shard, n.nodename, n.nodeport
                     FROM (SELECT get_shard_id_for_distribution_column('sessions', s) AS shard, i
                           FROM unnest($1::bytea[]) WITH ORDINALITY AS t (s, i)) AS q
                     JOIN pg_dist_placement p ON p.shardid = q.shard
                     JOIN pg_dist_node n ON n.groupid = p.groupid AND n.noderole = 'primary'
                     ORDER BY q.i, n.groupid",
                )
                .bind(ids)
                .fetch_all(&self.0.pool)
                .await?;
                if rows.len() != sessions.len() {
                    return Err(crate::store::Error::Corrupt(
                        "a session's shard has no primary placement".into(),
                    ));
                }
                if let Some(workers) = &self.0.workers {
                    let nodes = rows.iter().map(|(_, _, name, port)| {
                        (name.clone(), u16::try_from(*port).unwrap_or_default())
                    });
                    workers.remember(sessions, nodes);
                }
                Ok(rows
                    .into_iter()
                    .map(|(node, shard, _, _)| (node, shard))
                    .collect())
            }
            // A session's own number: its id's random bytes (UUID v7: time, then random).
            Batching::BySession | Batching::Spread => Ok(sessions
                .iter()
                .map(|s| {
                    let b = s.as_bytes();
                    let own =
                        i64::from_be_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]);
                    let key = match self.0.batching {
                        Batching::Spread => own.rem_euclid(i64::from(super::COMMIT_LANES)),
                        _ => own,
                    };
                    (key, key)
                })
                .collect()),
        }
    }

    fn writes_at_once(&self) -> bool {
        // The distributed form on one database (`BySession`) keeps the statements one by one:
        // it stands for Citus in the routing test, which checks each statement's key.
        self.0.batching != Batching::BySession
    }

    async fn write_at_once(
        &mut self,
        rows: &BatchRows,
        targets: &[(SessionId, BranchName, Option<NodeId>)],
    ) -> Result<Option<bool>> {
        let ours = |session: &SessionId| targets.iter().any(|(s, _, _)| s == session);
        let only_nodes_blobs_and_heads = rows.opened.is_empty()
            && rows.closes.is_empty()
            && rows.function_heads.is_empty()
            && rows.pins.is_empty()
            && rows.idempotency.is_empty()
            && rows.nodes.iter().all(|n| ours(&n.insert.session))
            && rows.blobs.iter().all(|b| ours(&b.session))
            && rows.branch_heads.len() == targets.len();
        let Some(first) = targets.first().map(|(s, _, _)| *s) else {
            return Ok(None);
        };
        let mut heads = Vec::with_capacity(targets.len());
        for (session, branch, _) in targets {
            match rows.branch_heads.get(&(*session, branch.clone())) {
                Some(head) => heads.push(*head),
                None => return Ok(None),
            }
        }
        if !only_nodes_blobs_and_heads {
            return Ok(None);
        }
        let bytes = |id: &[u8; 16]| id.to_vec();
        let nodes = &rows.nodes;
        // One call of `ctxd_append_at_once` (migrations/postgres/0007): blobs and nodes
        // written, then each head moved only if it is still the expected one, in one
        // statement, so one commit or nothing. On Citus the call runs whole on the worker of
        // the first session's shard, which holds every session of the call (a transaction's
        // sessions share a shard).
        let moved: std::result::Result<i64, sqlx::Error> = sqlx::query_scalar(
            "SELECT ctxd_append_at_once($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13,
                                        $14, $15, $16, $17, $18, $19, $20)",
        )
        .bind(bytes(first.as_bytes()))
        .bind(
            targets
                .iter()
                .map(|(s, _, _)| bytes(s.as_bytes()))
                .collect::<Vec<_>>(),
        )
        .bind(
            targets
                .iter()
                .map(|(_, b, _)| b.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            targets
                .iter()
                .map(|(_, _, e)| e.as_ref().map(|id| bytes(id.as_bytes())))
                .collect::<Vec<_>>(),
        )
        .bind(
            heads
                .iter()
                .map(|(id, _)| bytes(id.as_bytes()))
                .collect::<Vec<_>>(),
        )
        .bind(heads.iter().map(|(_, at)| *at).collect::<Vec<_>>())
        .bind(
            rows.blobs
                .iter()
                .map(|b| bytes(b.session.as_bytes()))
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.blobs
                .iter()
                .map(|b| b.hash.0.to_vec())
                .collect::<Vec<_>>(),
        )
        .bind(rows.blobs.iter().map(|b| b.size).collect::<Vec<_>>())
        .bind(rows.blobs.iter().map(|b| b.codec).collect::<Vec<_>>())
        .bind(
            rows.blobs
                .iter()
                .map(|b| b.data.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            nodes
                .iter()
                .map(|n| bytes(n.insert.session.as_bytes()))
                .collect::<Vec<_>>(),
        )
        .bind(
            nodes
                .iter()
                .map(|n| bytes(n.insert.id.as_bytes()))
                .collect::<Vec<_>>(),
        )
        .bind(
            nodes
                .iter()
                .map(|n| n.insert.parent.map(|id| bytes(id.as_bytes())))
                .collect::<Vec<_>>(),
        )
        .bind(
            nodes
                .iter()
                .map(|n| n.insert.function.map(|id| bytes(id.as_bytes())))
                .collect::<Vec<_>>(),
        )
        .bind(nodes.iter().map(|n| n.kind).collect::<Vec<_>>())
        .bind(
            nodes
                .iter()
                .map(|n| n.insert.created_at_ms)
                .collect::<Vec<_>>(),
        )
        .bind(
            nodes
                .iter()
                .map(|n| n.insert.hash.0.to_vec())
                .collect::<Vec<_>>(),
        )
        .bind(nodes.iter().map(|n| n.body.clone()).collect::<Vec<_>>())
        .bind(nodes.iter().map(|n| n.body_z.clone()).collect::<Vec<_>>())
        .fetch_one(&self.0.at_once_pool(first))
        .await;
        match moved {
            Ok(moved) => Ok(Some(moved == 1)),
            // The rows it writes refer to what a concurrent deletion removed (the session, the
            // remembered head): nothing was written, and the usual way reads what is left.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("23503") => {
                Ok(Some(false))
            }
            // A head that moved on raises CTXHM, a conflict: the caller writes the batch the
            // usual way.
            Err(e) => Err(e.into()),
        }
    }

    async fn begin(&mut self) -> Result<()> {
        self.0.tx = Some(self.0.pool.begin().await?);
        Ok(())
    }

    async fn commit(&mut self) -> Result<()> {
        match self.0.tx.take() {
            Some(tx) => Ok(tx.commit().await?),
            None => Ok(()),
        }
    }

    async fn rollback(&mut self) {
        if let Some(tx) = self.0.tx.take()
            && let Err(e) = tx.rollback().await
        {
            tracing::warn!(error = %e, "rolling back a failed batch failed");
        }
    }

    async fn close(self: Box<Self>) {}
}
