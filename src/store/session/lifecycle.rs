//! The end of a session's life: deleting it (with its tombstone), the sessions a retention
//! policy finds idle, and the store's size and free space.

use super::{Fault, Result, Store};
use crate::domain::{self, CompactionId, SessionId, Tenant, Tombstone};
use crate::store::backend::{Deleted, Footprint};
use crate::store::form::clock::now_ms;

/// What [`Store::delete_session`] did.
#[derive(Debug, Clone)]
pub struct Deletion {
    pub tombstone: Tombstone,
    /// The session had been deleted before; nothing changed.
    pub already_deleted: bool,
    /// Blobs (and their unpacked bytes) no other session referred to, removed with it.
    pub blobs: u64,
    pub blob_bytes: u64,
}

impl Store {
    /// Deletes `session` of `tenant` in one transaction, leaving its tombstone. Deleting it
    /// again answers the tombstone; another tenant's session, or an unknown one, is not found
    /// (the same answer, so neither tells the other exists).
    pub async fn delete_session(
        &self,
        tenant: &Tenant,
        session: SessionId,
        deleted_by: &str,
    ) -> Result<Deletion> {
        let deletion = self
            .delete(Doomed {
                tenant,
                session,
                deleted_by,
                idle_since_ms: None,
            })
            .await?;
        Ok(deletion.expect("a deletion without an idleness condition happens"))
    }

    /// Deletes `session` for the retention policy if, checked in the deleting transaction, no
    /// branch of it moved since `idle_since_ms`; `None` when one did (or it is gone).
    pub async fn delete_idle_session(
        &self,
        tenant: &Tenant,
        session: SessionId,
        idle_since_ms: i64,
    ) -> Result<Option<Deletion>> {
        let doomed = Doomed {
            tenant,
            session,
            deleted_by: Tombstone::RETENTION,
            idle_since_ms: Some(idle_since_ms),
        };
        match self.delete(doomed).await {
            Err(super::Error::Domain(domain::Error::NotFound { .. })) => Ok(None),
            Ok(Some(deletion)) if deletion.already_deleted => Ok(None),
            other => other,
        }
    }

    async fn delete(&self, doomed: Doomed<'_>) -> Result<Option<Deletion>> {
        let mut attempt = 1;
        loop {
            match self.delete_once(&doomed).await {
                // The engine broke a lock cycle with appends to the session (PostgreSQL's
                // deadlock detection): nothing was deleted, so the deletion runs again.
                Err(e) if e.fault() == Some(Fault::Conflict) && attempt < DELETE_ATTEMPTS => {
                    tracing::warn!(error = %e, attempt, "a session's deletion conflicted; retrying");
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn delete_once(&self, doomed: &Doomed<'_>) -> Result<Option<Deletion>> {
        let Doomed {
            tenant,
            session,
            deleted_by,
            idle_since_ms,
        } = *doomed;
        let mut tx = self.backend.begin_delete().await?;
        match tx.lock_session(session).await? {
            Some(owner) if &owner == tenant => {
                if let Some(since) = idle_since_ms {
                    let branches = tx.branches(session).await?;
                    if branches.iter().any(|b| b.updated_at_ms >= since) {
                        tx.rollback().await?;
                        return Ok(None);
                    }
                }
                let Deleted {
                    tombstone,
                    blobs,
                    blob_bytes,
                } = tx
                    .delete_session(Tombstone {
                        session,
                        tenant: tenant.clone(),
                        deleted_by: deleted_by.to_owned(),
                        deleted_at_ms: now_ms(),
                        nodes: 0,
                        branches: 0,
                        summaries: 0,
                    })
                    .await?;
                tx.commit().await?;
                self.forget(session);
                self.changes.touched(session);
                Ok(Some(Deletion {
                    tombstone,
                    already_deleted: false,
                    blobs,
                    blob_bytes,
                }))
            }
            Some(_) => Err(domain::Error::not_found("session", session).into()),
            None => {
                let found = tx.tombstone(session).await?;
                tx.rollback().await?;
                match found {
                    Some(tombstone) if &tombstone.tenant == tenant => Ok(Some(Deletion {
                        tombstone,
                        already_deleted: true,
                        blobs: 0,
                        blob_bytes: 0,
                    })),
                    _ => Err(domain::Error::not_found("session", session).into()),
                }
            }
        }
    }

    /// The tombstone of the session compaction `id` belonged to, when that session was deleted
    /// while the plan was open. The caller checks the tombstone's tenant.
    pub async fn plan_tombstone(&self, id: CompactionId) -> Result<Option<Tombstone>> {
        self.read().await?.plan_tombstone(id).await
    }

    /// The tombstone of `session`, if it was deleted. The caller checks its tenant.
    pub async fn tombstone(&self, session: SessionId) -> Result<Option<Tombstone>> {
        self.read().await?.tombstone(session).await
    }

    /// Up to `limit` sessions no branch of which moved since `idle_since_ms`, oldest first.
    pub async fn idle_sessions(
        &self,
        idle_since_ms: i64,
        limit: u32,
        tenants: Tenants<'_>,
    ) -> Result<Vec<(SessionId, Tenant)>> {
        let mut conn = self.read().await?;
        let ids = conn.idle_sessions(idle_since_ms, limit, tenants).await?;
        let mut found = Vec::with_capacity(ids.len());
        for id in ids {
            // Deleted since by someone else: nothing to do.
            if let Some(tenant) = conn.session_tenant(id).await? {
                found.push((id, tenant));
            }
        }
        Ok(found)
    }

    /// Live sessions and tombstones.
    pub async fn session_counts(&self) -> Result<(u64, u64)> {
        self.read().await?.session_counts().await
    }

    pub async fn footprint(&self) -> Result<Footprint> {
        self.backend.footprint().await
    }

    /// Gives deleted rows' space back to the system where the engine can do it online.
    pub async fn release_free_space(&self) -> Result<()> {
        self.backend.release_free_space().await
    }

    /// Drops what the caches hold of a deleted session: its owner, and (as the read cache is
    /// not kept by session) every cached node and path, which later reads fill again.
    fn forget(&self, session: SessionId) {
        self.owners.forget(session);
        self.cache.lock().expect("read cache lock").clear();
    }
}

/// A session to delete: whose, by whom, and, for the retention policy, the moment since which
/// no branch of it may have moved.
struct Doomed<'a> {
    tenant: &'a Tenant,
    session: SessionId,
    deleted_by: &'a str,
    idle_since_ms: Option<i64>,
}

/// Whose sessions a lookup takes.
#[derive(Debug, Clone, Copy)]
pub enum Tenants<'a> {
    Only(&'a Tenant),
    /// Every tenant but these.
    Except(&'a [Tenant]),
}

/// How many times a deletion that lost a lock cycle runs at most.
const DELETE_ATTEMPTS: u32 = 4;
