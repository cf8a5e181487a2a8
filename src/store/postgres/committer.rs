//! The PostgreSQL group committer's connection: each batch is one transaction on a connection of
//! the committer's own pool (a dropped connection is replaced by the pool on the next batch).
//! The rows a batch decides on (branch and function heads) are locked as it reads them, so
//! batches of two replicas on one branch take turns, and the later one checks its appends
//! against the head the earlier one committed.

use async_trait::async_trait;
use sqlx::postgres::PgPool;
use sqlx::{PgConnection, Postgres};

use super::{Conn, Connection};
use crate::store::Result;
use crate::store::backend::CommitterConnection;

pub(super) struct Committer {
    pool: PgPool,
    tx: Option<sqlx::Transaction<'static, Postgres>>,
}

impl Committer {
    pub(super) fn new(pool: PgPool) -> Self {
        Self { pool, tx: None }
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
}

#[async_trait]
impl CommitterConnection for Conn<Committer> {
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
