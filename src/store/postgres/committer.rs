//! The PostgreSQL group committer's connection: each batch is one transaction on a connection of
//! the committer's own pool (a dropped connection is replaced by the pool on the next batch).
//! The rows a batch decides on (branch and function heads) are locked as it reads them, so
//! batches of two replicas on one branch take turns, and the later one checks its appends
//! against the head the earlier one committed. On a distributed database each lane of the
//! committer is one of these, and a batch's transaction holds one shard's appends.

use async_trait::async_trait;
use sqlx::postgres::PgPool;
use sqlx::{PgConnection, Postgres};

use super::{Conn, Connection};
use crate::domain::SessionId;
use crate::store::Result;
use crate::store::backend::CommitterConnection;

/// How the committer splits a batch into transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Batching {
    /// One transaction for the whole batch (one database).
    One,
    /// One per Citus shard, as Citus maps the sessions.
    ByShard,
    /// One per session (the distributed form on one database, for its tests).
    BySession,
}

pub(super) struct Committer {
    pool: PgPool,
    tx: Option<sqlx::Transaction<'static, Postgres>>,
    batching: Batching,
}

impl Committer {
    pub(super) fn new(pool: PgPool, batching: Batching) -> Self {
        Self {
            pool,
            tx: None,
            batching,
        }
    }
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
        self.batching != Batching::One
    }
}

#[async_trait]
impl CommitterConnection for Conn<Committer> {
    fn sharded(&self) -> bool {
        self.0.batching != Batching::One
    }

    async fn shards(&mut self, sessions: &[SessionId]) -> Result<Vec<i64>> {
        match self.0.batching {
            Batching::ByShard => {
                let ids: Vec<Vec<u8>> = sessions.iter().map(|s| s.as_bytes().to_vec()).collect();
                // Computed on the coordinator from its metadata: no shard is read.
                Ok(sqlx::query_scalar(
                    "SELECT get_shard_id_for_distribution_column('sessions', s)
                     FROM unnest($1::bytea[]) WITH ORDINALITY AS t (s, i) ORDER BY i",
                )
                .bind(ids)
                .fetch_all(&self.0.pool)
                .await?)
            }
            // A session's own number: its id's leading bytes (UUID v7: time, then random).
            Batching::BySession | Batching::One => Ok(sessions
                .iter()
                .map(|s| {
                    let b = s.as_bytes();
                    i64::from_be_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]])
                })
                .collect()),
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
