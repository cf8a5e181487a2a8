//! Distributing ctxd's tables over a Citus cluster: at start, after the migrations, every table
//! not yet distributed is, by session and co-located (the few keyed otherwise by their own
//! key), so a table a later migration adds is distributed by the next start; and whether the
//! database is distributed, which makes the committer split its batches by shard.

use sqlx::postgres::PgPool;
use sqlx::{PgConnection, PgExecutor};

use crate::store::Result;

/// Each table, the column it is distributed by, and what it is co-located with, in an order
/// where a table comes after every table its foreign keys name (docs/scaling.md says why
/// each table that is not keyed by session is distributed by its own key).
pub const TABLES: [(&str, &str, &str); 18] = [
    ("sessions", "id", "default"),
    ("nodes", "session_id", "sessions"),
    ("blobs", "session_id", "sessions"),
    ("branches", "session_id", "sessions"),
    ("functions", "session_id", "sessions"),
    ("idempotency", "session_id", "sessions"),
    ("compactions", "session_id", "sessions"),
    ("summaries", "session_id", "sessions"),
    ("compaction_events", "session_id", "sessions"),
    ("pins", "session_id", "sessions"),
    ("gateway_calls", "session_id", "sessions"),
    ("gateway_conversations", "session_id", "sessions"),
    ("summarizer_sources", "session_id", "sessions"),
    ("tombstones", "session_id", "sessions"),
    // Looked up by tenant and key before the session exists.
    ("session_keys", "key", "none"),
    // CommitSummary and CancelCompaction name only the plan.
    ("compaction_owners", "id", "none"),
    ("tombstone_plans", "compaction_id", "none"),
    // The summarizer's cache, shared by every session.
    ("summarizer_outputs", "source_key", "none"),
];

/// Held while a replica distributes, so two replicas starting together take turns (the
/// second finds the tables distributed).
const LOCK: i64 = 0x6374_7864_6469_7374; // "ctxddist"

/// Whether the database has the `citus` extension.
pub(super) async fn citus(pool: &PgPool) -> Result<bool> {
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')")
            .fetch_one(pool)
            .await?,
    )
}

/// Whether `sessions` is distributed (by ctxd or by the operator): then a transaction that
/// holds appends of sessions on different shards would commit in two phases.
pub(super) async fn distributed(pool: &PgPool) -> Result<bool> {
    is_distributed(pool, "sessions").await
}

async fn is_distributed<'e>(db: impl PgExecutor<'e>, table: &str) -> Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass($1))",
    )
    .bind(table)
    .fetch_one(db)
    .await?)
}

/// Distributes every table of [`TABLES`] not distributed yet; returns how many it did.
pub(super) async fn distribute(pool: &PgPool) -> Result<usize> {
    let mut conn = pool.acquire().await?;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(LOCK)
        .execute(&mut *conn)
        .await?;
    let done = distribute_missing(&mut conn).await;
    // Unlocked whatever happened: the lock is the connection's, which goes back to the pool.
    let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(LOCK)
        .execute(&mut *conn)
        .await;
    let done = done?;
    unlocked?;
    Ok(done)
}

/// The functions an append calls, each with the argument it is delegated by: Citus runs a
/// call on the worker that holds that session's shard (co-located with `sessions`).
pub const FUNCTIONS: [(&str, &str); 1] = [(
    "ctxd_append_at_once(bytea, bytea[], text[], bytea[], bytea[], bigint[], bytea[], bytea[], \
     bigint[], bigint[], bytea[], bytea[], bytea[], bytea[], bytea[], bigint[], bigint[], \
     bytea[], text[], bytea[])",
    "p_session",
)];

async fn distribute_missing(conn: &mut PgConnection) -> Result<usize> {
    let mut done = 0;
    for (table, column, colocate) in TABLES {
        if is_distributed(&mut *conn, table).await? {
            continue;
        }
        sqlx::query("SELECT create_distributed_table($1::regclass, $2, colocate_with => $3)")
            .bind(table)
            .bind(column)
            .bind(colocate)
            .execute(&mut *conn)
            .await?;
        tracing::info!(table, column, colocate, "distributed");
        done += 1;
    }
    for (function, argument) in FUNCTIONS {
        let delegated: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_dist_object
                            WHERE objid = to_regprocedure($1)::oid AND distribution_argument_index IS NOT NULL)",
        )
        .bind(function)
        .fetch_one(&mut *conn)
        .await?;
        if delegated {
            continue;
        }
        sqlx::query(
            "SELECT create_distributed_function($1::regprocedure, $2,
                                                colocate_with => 'sessions')",
        )
        .bind(function)
        .bind(argument)
        .execute(&mut *conn)
        .await?;
        tracing::info!(function, argument, "distributed");
        done += 1;
    }
    Ok(done)
}
