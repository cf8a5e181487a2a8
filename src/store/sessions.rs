//! Sessions: creating (with a creation key, so a retry finds the session it made), listing and
//! reading them, and the rows a new session starts with.

use std::collections::BTreeMap;

use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection};

use super::branches::branches;
use super::clock::now_ms;
use super::idempotency::CreationKey;
use super::rows::{hash_column, required_uuid};
use super::{Error, Result, Scoped, Store};
use crate::domain::{self, Branch, BranchName, Session, SessionId, Tenant};

impl Store {
    /// A new session of `tenant`, with branch `main` and no head; with a `key` already used
    /// for the same request, the session that request created.
    pub async fn create_session(
        &self,
        tenant: &Tenant,
        metadata: BTreeMap<String, String>,
        key: Option<&CreationKey>,
    ) -> Result<Session> {
        let id = SessionId::new();
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        if let Some(existing) = keyed_session(&mut tx, tenant, key).await? {
            tx.rollback().await?;
            // Keys are per tenant: the session a key names is the caller's.
            return self.get_session(Scoped::trusted(existing)).await;
        }
        insert_session(&mut tx, id, tenant, now, &metadata).await?;
        remember_key(&mut tx, tenant, key, id, now).await?;
        tx.commit().await?;
        self.owners.remember(id, tenant);
        Ok(Session {
            id,
            created_at_ms: now,
            metadata,
            compaction_count: 0,
            branches: vec![Branch {
                name: BranchName::main(),
                head: None,
                updated_at_ms: now,
            }],
        })
    }

    /// The tenant `id` belongs to; `None` for an unknown session.
    pub async fn session_tenant(&self, id: SessionId) -> Result<Option<Tenant>> {
        let mut conn = self.reader.acquire().await?;
        let tenant: Option<String> = sqlx::query_scalar("SELECT tenant FROM sessions WHERE id = ?")
            .bind(id.as_bytes().as_slice())
            .fetch_optional(&mut *conn)
            .await?;
        Ok(tenant.map(Tenant::new))
    }

    pub async fn get_session(&self, id: Scoped) -> Result<Session> {
        let id = id.id();
        let mut conn = self.reader.acquire().await?;
        let row = sqlx::query(
            "SELECT id, created_at_ms, metadata, compaction_count FROM sessions WHERE id = ?",
        )
        .bind(id.as_bytes().as_slice())
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| domain::Error::not_found("session", id))?;
        session_from_row(&mut conn, &row).await
    }

    /// Sessions newest first, starting after `after`; also returns the cursor of the next page.
    pub async fn list_sessions(
        &self,
        tenant: &Tenant,
        page_size: u32,
        after: Option<SessionId>,
    ) -> Result<(Vec<Session>, Option<SessionId>)> {
        let mut conn = self.reader.acquire().await?;
        // A UUID v7 sorts by creation time, so the id is the cursor. One extra row tells
        // whether a next page exists.
        let after = after.map(|id| id.as_bytes().to_vec());
        let rows = sqlx::query(
            "SELECT id, created_at_ms, metadata, compaction_count FROM sessions
             WHERE tenant = ?1 AND (?2 IS NULL OR id < ?2) ORDER BY id DESC LIMIT ?3",
        )
        .bind(tenant.as_str())
        .bind(after)
        .bind(i64::from(page_size) + 1)
        .fetch_all(&mut *conn)
        .await?;
        let mut sessions = Vec::with_capacity(rows.len());
        for row in rows.iter().take(page_size as usize) {
            sessions.push(session_from_row(&mut conn, row).await?);
        }
        let next = (rows.len() > page_size as usize)
            .then(|| sessions.last().map(|s| s.id))
            .flatten();
        Ok((sessions, next))
    }
}

/// The session an earlier call with `key` created; a key used for a different request is
/// refused.
pub(super) async fn keyed_session(
    conn: &mut SqliteConnection,
    tenant: &Tenant,
    key: Option<&CreationKey>,
) -> Result<Option<SessionId>> {
    let Some(key) = key else { return Ok(None) };
    let Some(row) = sqlx::query(
        "SELECT request_hash, session_id FROM session_keys WHERE tenant = ? AND key = ?",
    )
    .bind(tenant.as_str())
    .bind(&key.key)
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(None);
    };
    if hash_column(&row, "request_hash")? != key.request {
        return Err(domain::Error::FailedPrecondition(format!(
            "idempotency_key: {:?} was used for a different request",
            key.key
        ))
        .into());
    }
    Ok(Some(SessionId::from_bytes(required_uuid(
        &row,
        "session_id",
    )?)))
}

pub(super) async fn remember_key(
    conn: &mut SqliteConnection,
    tenant: &Tenant,
    key: Option<&CreationKey>,
    session: SessionId,
    now: i64,
) -> Result<()> {
    let Some(key) = key else { return Ok(()) };
    sqlx::query(
        "INSERT INTO session_keys (tenant, key, request_hash, session_id, created_at_ms)
         VALUES (?, ?, ?, ?, ?)",
    )
    .bind(tenant.as_str())
    .bind(&key.key)
    .bind(key.request.0.as_slice())
    .bind(session.as_bytes().as_slice())
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Inserts a session row and its empty `main` branch.
pub(super) async fn insert_session(
    conn: &mut SqliteConnection,
    id: SessionId,
    tenant: &Tenant,
    now: i64,
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let metadata = serde_json::to_string(metadata).expect("a string map serializes");
    sqlx::query("INSERT INTO sessions (id, tenant, created_at_ms, metadata) VALUES (?, ?, ?, ?)")
        .bind(id.as_bytes().as_slice())
        .bind(tenant.as_str())
        .bind(now)
        .bind(&metadata)
        .execute(&mut *conn)
        .await?;
    sqlx::query("INSERT INTO branches (session_id, name, updated_at_ms) VALUES (?, ?, ?)")
        .bind(id.as_bytes().as_slice())
        .bind(BranchName::main().as_str())
        .bind(now)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

async fn session_from_row(conn: &mut SqliteConnection, row: &SqliteRow) -> Result<Session> {
    let id = SessionId::from_bytes(required_uuid(row, "id")?);
    let metadata: String = row.try_get("metadata")?;
    let compaction_count: i64 = row.try_get("compaction_count")?;
    Ok(Session {
        id,
        created_at_ms: row.try_get("created_at_ms")?,
        metadata: serde_json::from_str(&metadata)
            .map_err(|e| Error::Corrupt(format!("session metadata: {e}")))?,
        compaction_count: u32::try_from(compaction_count).unwrap_or(u32::MAX),
        branches: branches(conn, id).await?,
    })
}
