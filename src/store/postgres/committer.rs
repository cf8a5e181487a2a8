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
        self.batching != Batching::Spread
    }
}

#[async_trait]
impl CommitterConnection for Conn<Committer> {
    fn sharded(&self) -> bool {
        true
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
            // A session's own number: its id's random bytes (UUID v7: time, then random).
            Batching::BySession | Batching::Spread => Ok(sessions
                .iter()
                .map(|s| {
                    let b = s.as_bytes();
                    let own =
                        i64::from_be_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]);
                    match self.0.batching {
                        Batching::Spread => own.rem_euclid(i64::from(super::COMMIT_LANES)),
                        _ => own,
                    }
                })
                .collect()),
        }
    }

    fn writes_at_once(&self) -> bool {
        // Citus splits a statement's data-modifying CTEs apart, so there it is no longer one.
        self.0.batching == Batching::Spread
    }

    async fn write_at_once(
        &mut self,
        rows: &BatchRows,
        session: SessionId,
        branch: &BranchName,
        expected: Option<NodeId>,
    ) -> Result<Option<bool>> {
        let only_nodes_and_blobs = rows.opened.is_empty()
            && rows.closes.is_empty()
            && rows.function_heads.is_empty()
            && rows.pins.is_empty()
            && rows.idempotency.is_empty()
            && rows.nodes.iter().all(|n| n.insert.session == session)
            && rows.blobs.iter().all(|b| b.session == session);
        let head = match rows.branch_heads.iter().next() {
            Some(((s, name), head)) if *s == session && name == branch => *head,
            _ => return Ok(None),
        };
        if !only_nodes_and_blobs || rows.branch_heads.len() != 1 {
            return Ok(None);
        }
        let bytes = |id: NodeId| id.as_bytes().to_vec();
        let nodes = &rows.nodes;
        // Blobs and nodes are written only if the head moved, i.e. it was still `expected`:
        // the UPDATE waits for a concurrent writer of the row and checks the head it then
        // finds. Every part is one statement, so one commit, or nothing.
        let moved: i64 = sqlx::query_scalar(
            "WITH head AS (
                 UPDATE branches SET head_id = $1, updated_at_ms = $2
                 WHERE session_id = $3 AND name = $4 AND head_id IS NOT DISTINCT FROM $5
                 RETURNING 1
             ), blob_rows AS (
                 INSERT INTO blobs (session_id, hash, size, codec, data)
                 SELECT $3, * FROM unnest($6::bytea[], $7::int8[], $8::int8[], $9::bytea[])
                 WHERE EXISTS (SELECT 1 FROM head)
                 ON CONFLICT (session_id, hash) DO NOTHING
             ), node_rows AS (
                 INSERT INTO nodes (session_id, id, parent_id, function_id, kind,
                                    created_at_ms, hash, body, body_z)
                 SELECT $3, * FROM unnest($10::bytea[], $11::bytea[], $12::bytea[],
                                          $13::int8[], $14::int8[], $15::bytea[],
                                          $16::text[], $17::bytea[])
                 WHERE EXISTS (SELECT 1 FROM head)
             )
             SELECT count(*) FROM head",
        )
        .bind(bytes(head.0))
        .bind(head.1)
        .bind(session.as_bytes().to_vec())
        .bind(branch.as_str())
        .bind(expected.map(bytes))
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
        .bind(nodes.iter().map(|n| bytes(n.insert.id)).collect::<Vec<_>>())
        .bind(
            nodes
                .iter()
                .map(|n| n.insert.parent.map(bytes))
                .collect::<Vec<_>>(),
        )
        .bind(
            nodes
                .iter()
                .map(|n| n.insert.function.map(bytes))
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
        .fetch_one(&self.0.pool)
        .await?;
        Ok(Some(moved == 1))
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
